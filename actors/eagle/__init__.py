"""EAGLE-style draft head for the default target: a one-layer head that drafts from the target's
own final hidden states (features) over a reduced vocabulary.

- ``head``: the head module, its save/load format and the committed default head's path;
- ``proposer``: the Proposer that feeds the head the target's features and drafts chains;
- ``prompt_mix``, ``data``, ``train``: the reproducible self-distillation recipe
  (``python -m actors.eagle.train --out DIR``).
"""
