"""``testbed image build``: what a backend's workers start from (the docker worker image, the
guest of backend: vm), built by the backend itself (:meth:`Backend.build_image`)."""

from __future__ import annotations

import typer

from testbed.cli.params import Choices, Group, JsonOpt, choice
from testbed.cli.render import emit, guard, plain, sayer

app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None,
                  help="Worker images for backend: docker (and the guest of backend: vm).")


def _image_backends() -> list[str]:
    """The backends that build something (a backend that needs nothing inherits the no-op).
    Read when ``image build`` is used: the backends' modules are imported then, not with
    every command."""
    from testbed.nodes import BACKENDS
    from testbed.nodes.base import Backend

    return [n for n, b in BACKENDS.items() if type(b).build_image is not Backend.build_image]


IMAGE_BACKENDS = Choices("image backend", _image_backends, metavar="BACKEND")


@app.command("build")
def image_build(
    backend: str = choice("docker", "--backend", choices=IMAGE_BACKENDS, help="The backend whose image to build."),
    tag: str = typer.Option("testbed/worker:cpu", "--tag", metavar="TAG", help="Image tag to build (docker)."),
    force: bool = typer.Option(False, "--force", help="Rebuild the last step even if the content key matches."),
    vm: bool = typer.Option(False, "--vm", help="The same as --backend vm: the guest of backend: vm (Debian's "
                            "kernel, fetched once with apt-get download, and a busybox initramfs)."),
    as_json: bool = JsonOpt,
):
    """Build the CPU worker image offline (debootstrap + pinned torch + workloads; cached by content)."""
    from testbed.nodes import BACKENDS

    name = "vm" if vm else backend
    with guard(as_json):
        res = BACKENDS[name].build_image(sayer(as_json), force=force, tag=tag)
        if as_json:
            emit(res)
            return
        assert res is not None  # IMAGE_BACKENDS (and vm) build something: only Backend's no-op returns None
        if "kernel" in res:
            plain(f"VM guest: kernel {res['kernel']}, initramfs {res['initrd']} "
                  f"({'cached' if res['cached'] else 'built'} in {res['seconds']:.1f} s)")
        else:
            plain(f"{res['tag']}: {res['id'][:19]} ({'cached' if res['cached'] else 'built'} in "
                  f"{res['seconds']:.1f} s)")
