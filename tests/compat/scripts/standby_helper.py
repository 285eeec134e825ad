"""Imported by standby_probe.py from the script's own directory (sys.path[0])."""
VALUE = "helper from the script's directory"
