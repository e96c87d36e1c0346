"""The embedded policy engines: how the bundled model is served in this process, and measured per machine.

- `weights`: the bundled SmolLM2 GGUF, its tokenizer folder, and the bf16 safetensors conversion torch needs;
- `client`, `sampling`: what both engines share (the `PolicyClient` surface, the sampler and its loop);
- `llamacpp_engine` (the default) with `gguf_lora` (PEFT LoRA → GGUF LoRA): llama.cpp through its C API;
  `llamacpp_build` compiles llama.cpp with CPU variants (`make install`), `cpu_backend` picks the one this CPU runs;
- `local_policy` with `decode_kernels` and `compiled_decode`: the torch engine, the trainer's own kernels;
- `threads`: thread counts measured per machine, and the back-off while the cores are oversubscribed.

Importing this package is cheap: torch, transformers and llama.cpp are imported by the modules that need them.
"""
