"""Speculative decoding (layer 3): sampling and rejection sampling, the speculative round loop, and
the drafting methods with their registry (vanilla, MagicDec, SPIRe, the
verification-guided sparse self-draft, prompt lookup; method §1, §3.5, §4). Imports
`spirelib.model` and below."""

from spirelib.decoding import drafts, guided, lookup  # noqa: F401  every drafting method registered on any import
