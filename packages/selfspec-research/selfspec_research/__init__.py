"""selfspec research code: the thinker (task generators, training, evaluation) and CoSpec training."""
