"""The wire between the master, the workers and tree parents: message framing, Sessions and links, serving, shared
memory, security, the status mapping and the machine identity."""
