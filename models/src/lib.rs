//! Model loading (GGUF, HF safetensors), tokenizers, chat templates and the Llama forward pass.
