"""How ranks start (docs/zygote.md): the launcher's side (launcher), the fork server (server),
a rank's client inside its node (client), the forked rank (child)."""
