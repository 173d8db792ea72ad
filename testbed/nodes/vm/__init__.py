"""The vm backend (backend): the guest's image (image), its agent (agent: standard library
only, it runs in the guest), the host-side relay into it (relay), QEMU on the host (accel,
qemu, proc)."""
