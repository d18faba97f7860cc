"""Date and time formats of the console and pages (``FORMAT_MODULE_PATH``): ISO-like, with seconds."""
