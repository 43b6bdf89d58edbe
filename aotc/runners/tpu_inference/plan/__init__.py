"""tpu-inference's plan: its paddings, precompile loops and entry rules re-implemented as pure functions of an entry
and its model config, so plan and fingerprint run without JAX (the core imports these).

* buckets -- the Planner: the graphs an entry needs, in the order the stack's warm-up compiles them
* rules   -- the stack's entry rules (RunnerSpec.validate), which model code path an architecture takes
* gemma4_vision, llama_guard_4, qwen3_vl -- what a step with images compiles, per multimodal model the plan
  follows (each beside its serving fix in serving_fixes/)
"""
