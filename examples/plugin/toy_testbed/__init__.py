"""A toy plugin of testbed: a scheme (``toyscheme``) and a link type (``jumbo``).

Nothing here is imported by testbed until it is used: the scheme in the ranks when they
attach it, the link type when the CLI starts (it registers like a built-in one).
"""
