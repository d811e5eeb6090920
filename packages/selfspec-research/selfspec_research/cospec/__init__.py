"""CoSpec training and evaluation (the inference side is `selfspec.spec.cospec`)."""
