"""The jaxbuf version."""

__version__ = "0.3.0.dev0"
