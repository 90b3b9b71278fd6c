"""Speculative decoding (layer 3): sampling and rejection sampling, the speculative round loop, and
the drafting methods with their builder table (vanilla, MagicDec, SPIRe, the
verification-guided sparse self-draft, prompt lookup; method §1, §3.5, §4). Imports
`spirelib.model` and below."""
