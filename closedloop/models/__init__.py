"""Policy models: the built-in tiny Llama and loading, saving and fingerprinting of model directories."""
