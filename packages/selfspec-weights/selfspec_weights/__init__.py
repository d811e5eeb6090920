"""Weights that selfspec's packaged model names load: thinker LoRA adapters and distilled drafts.

A data package only: `selfspec.models.registry` finds this directory without importing it.
"""
