"""Shape-true synthetic GGUF files: random but valid quant blocks, written with gguf's own writer.
How tests and benchmarks get models of any size; timing does not depend on the weights' values."""
