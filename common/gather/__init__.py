"""One iteration's gather-and-decode, shared by the master and every tree parent: the round, the consistency policy it
may wait for, and the clock it reads."""
