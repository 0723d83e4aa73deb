"""Data in: NIfTI files and the offline demo sets as arrays (``nifti``, no PyTorch), resized to the network's grid
(``resample``) and served as tensors (``volumes``), label maps onto a preset's labels (``labels``), IXI and BraTS
roots (``ixi``, ``brats``), patches of a curriculum (``patches``) and the input pipeline that feeds the training loop
(``pipeline``)."""
