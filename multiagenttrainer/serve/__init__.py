"""Serving a model over OpenAI's HTTP API (`mat serve`): engines, the app, and running it.

How a request flows:

    server.serve_model   binds the port, picks and loads an engine, runs uvicorn until a signal
      middleware         bearer key (401), body size (413)
      app                routes, model name (404), limits (429, 400), calls the engine in threads
        protocol         OpenAI request models, refused options, response and stream bodies
        text             chat prompts (template or plain), stop sequences, streamed decoding
        engine           the Engine contract and registry: transformers_engine (in process, CPU or
                         GPU, PEFT adapter applied or merged) and vllm_engine (vLLM's server as a
                         supervised child process with --enable-lora)
    models               what to serve: a fine-tune job or a model folder and adapter, as a ModelSpec

Nothing here imports Prefect; torch and transformers are imported only by the engines, and the web
stack (starlette, uvicorn) only by `app` and `server`, so importing this package stays cheap.
"""

from multiagenttrainer.serve.engine import (
    ENGINES,
    Engine,
    EngineOptions,
    ModelSpec,
    SamplingParams,
    choose_engine,
    make_engine,
)
from multiagenttrainer.serve.models import spec_from_job, spec_from_paths

__all__ = [
    "ENGINES",
    "Engine",
    "EngineOptions",
    "ModelSpec",
    "SamplingParams",
    "choose_engine",
    "make_engine",
    "spec_from_job",
    "spec_from_paths",
]
