"""EAGLE-style draft head for the default target: a one-layer head that drafts from the target's
own final hidden states (features) over a reduced vocabulary.

- ``head``: the head module, its save/load format and the committed default head's path;
- ``proposer``: the Proposer that feeds the head the target's features and drafts chains.

The self-distillation recipe that makes the heads lives outside the engine, in the top-level
``training`` package (``python -m training.train --out DIR``).
"""
