"""Measurement (layer 4): tau with its intervals (method §5, §10), wall-clock decoding and its
profile, and the machine's calibration. Imports `spirelib.decoding` and below."""
