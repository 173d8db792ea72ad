"""Training workloads. Runs standalone under torchrun; never imports testbed."""
