// placeholder: replaced by the CUDA backend
