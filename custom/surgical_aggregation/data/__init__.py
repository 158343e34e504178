"""What both modalities share: label tables by class name, patient-level splits, the real label files
of torchxrayvision's data folder, and where derived files are kept."""
