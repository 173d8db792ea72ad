"""``testbed image build``: what a backend's workers start from (the docker worker image, the
guest of backend: vm), built by the backend itself (:meth:`Backend.build_image`)."""

from __future__ import annotations

from enum import Enum

import typer

from testbed.cli.params import Group, JsonOpt
from testbed.cli.render import emit, guard, plain, sayer
from testbed.nodes import BACKENDS

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                  help="Worker images for backend: docker (and the guest of backend: vm).")

ImageBackend = Enum("ImageBackend", {n: n for n, b in BACKENDS.items()
                                     if type(b).build_image is not type(BACKENDS["netns"]).build_image})
"""The backends that build something (a backend that needs nothing inherits the no-op)."""


@app.command("build")
def image_build(
    backend: ImageBackend = typer.Option("docker", "--backend", metavar="|".join(m.value for m in ImageBackend),
                                         help="The backend whose image to build."),
    tag: str = typer.Option("testbed/worker:cpu", "--tag", metavar="TAG", help="Image tag to build (docker)."),
    force: bool = typer.Option(False, "--force", help="Rebuild the last step even if the content key matches."),
    vm: bool = typer.Option(False, "--vm", help="The same as --backend vm: the guest of backend: vm (Debian's "
                            "kernel, fetched once with apt-get download, and a busybox initramfs)."),
    as_json: bool = JsonOpt,
):
    """Build the CPU worker image offline (debootstrap + pinned torch + workloads; cached by content)."""
    name = "vm" if vm else backend.value
    with guard(as_json):
        res = BACKENDS[name].build_image(sayer(as_json), force=force, tag=tag)
        if as_json:
            emit(res)
        elif "kernel" in res:
            plain(f"VM guest: kernel {res['kernel']}, initramfs {res['initrd']} "
                  f"({'cached' if res['cached'] else 'built'} in {res['seconds']:.1f} s)")
        else:
            plain(f"{res['tag']}: {res['id'][:19]} ({'cached' if res['cached'] else 'built'} in "
                  f"{res['seconds']:.1f} s)")
