"""GGUF model description and validation, quantizers, synthetic models, the HF exporter.

Pure Python + NumPy + gguf: never imports the CUDA binding.
"""
