"""vLLM 0.13's TPU plan: its paddings, capture_model loops and entry rules re-implemented as pure functions of an
entry and its model config, so plan and fingerprint run without torch (the core imports these).

* buckets -- the Planner: the graphs an entry needs, in the order capture_model compiles them
* rules   -- the stack's entry rules (RunnerSpec.validate)
"""
