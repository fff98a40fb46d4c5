"""specpair: pair a target model with a drafter before any big download.

The repository root is this package: `cli/` (commands), `sources/` (where metadata comes from),
`checkpoint/` (the normalized `Checkpoint` model), `formats/` (file layouts), `compat/` (rules and
verdicts per serving stack), `runtime/` (our own speculative-decoding runtime), `catalog/` (built-in
metadata of published checkpoints).
"""

__version__ = "0.1.0"
