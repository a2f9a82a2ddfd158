"""Placeholder: this scheme module is being written."""
