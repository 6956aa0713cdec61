"""The investigation agent: explains a detector's verdict on a local model, every claim checked.

Plain Python over the engine's windows (no Django): `tools` (the bounded job → node → fabric →
storage procedure), `model` (the writers: a local GGUF via llama-cpp-python, or a local
OpenAI-compatible endpoint), `validate` (every number, name, time and citation held to the
evidence), `run.investigate` (the whole investigation). docs/investigations.md.
"""
