"""GPU kernels (ADR 0021): a real ipykernel placed on a GPUlayer worker, picked in the launcher.

``provisioner.GPUlayerProvisioner`` (jupyter_client's ``gpulayer-provisioner``) starts the kernel
as a session; ``relay.LocalRelay`` binds its connection file's ports on the Jupyter host and moves
its messages through the control plane; ``spec`` makes the kernel specs (``gpulayer kernelspec``).
"""
