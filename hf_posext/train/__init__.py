"""The YaRN-style fine-tune recipe: patch -> data -> train -> save, on one or many devices.

Library code behind ``scripts/finetune.py``; see :func:`hf_posext.train.loop.train`.
"""
