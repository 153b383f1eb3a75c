"""How the shipped draft heads are made: the EAGLE self-distillation recipe and its data generators.

- ``train``: the CLI that runs the stages (``python -m training.train --out DIR``);
- ``prompt_mix``, ``korean_mix``, ``offline_text``: the prompts and offline conversations;
- ``data``: the target's answers through the engine and its teacher-forced features;
- ``hf_data``: the same stages through transformers' padded batches (``--backend hf``, GPU);
- ``fit``: fitting the head (``actors.eagle.head``) to the features, with held-out acceptance.

Training may import ``actors`` and ``cluster``; serving never imports ``training``.
"""
