"""The Med-DDPM 3D U-Net (paper §2.1, Fig. 3) and what computes it: the model, the Triton kernels
with their PyTorch references, FP8 convolutions, the NDHWC operations, and the parameter/FLOP
summary."""
