"""Optional model adapters and example plugins (their dependencies are extras, e.g. ``gradcode[torch]``)."""
