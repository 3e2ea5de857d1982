"""Hand-offs to serving engines: synthetic data from an OpenAI-compatible server (vLLM, SGLang) and
specbench's model-free drafters as vLLM proposers. See docs/scaling.md."""
