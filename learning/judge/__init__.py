"""The judge: an OpenAI-compatible JSON client (client.py) with an on-disk cache (cache.py) and the result types.

Importing this package is cheap; import the submodules you need (`learning.judge.client`, `learning.judge.types`).
"""
