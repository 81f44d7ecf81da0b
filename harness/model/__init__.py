"""What a matmul problem is: an implementation and its backend contract (core), the registry,
shapes and inputs, the float64 reference and error model (checking, activation_error), the
decode weight formats (quant) and CPU timing."""
