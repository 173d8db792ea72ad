"""The only code that talks to the kernel's network stack (pyroute2 / netlink)."""
