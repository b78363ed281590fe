"""Training of policy models.

- ``modes``: the training modes ``train.mode`` names (sft, rft, grpo), found by name; the train stage
  calls the one it names;
- ``causal_lm``: supervised fine-tuning on (prompt, completion) pairs (the warm start, sft, rft);
- ``grpo``: group-relative policy optimisation on rollouts; ``rounds``: its on-policy rounds' state;
- ``optimization``: the optimisation loop they share; ``checkpoints``: a run's state saved and resumed;
  ``batching``: batches drawn and padded or packed into tensors;
- ``lora``: LoRA adapters, merged before saving; ``candidate_record``: what a candidate says of its training.
"""
