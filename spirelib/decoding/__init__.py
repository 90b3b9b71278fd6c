"""Speculative decoding (layer 3): sampling and rejection sampling, the speculative round loop, and
the drafting methods with their registry (vanilla, MagicDec, SPIRe; method §1, §3.5). Imports
`spirelib.model` and below."""

from spirelib.decoding import drafts, guided, lookup  # noqa: F401  every drafting method registered on any import
