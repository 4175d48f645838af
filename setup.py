"""Build shim: ship the collector's auto-activation ``.pth`` at the root of site-packages.

Everything else is in pyproject.toml. A ``.pth`` file only works at the top of a site directory, where no
package-data option can put it, so ``build_py`` copies it to the root of the build tree (regular wheels
install that tree into site-packages) and, for ``pip install -e .``, straight into the editable wheel
(setuptools writes that wheel from the ``install_lib`` directory it configures; its data-files route is not
applied to editable wheels). The line is inert unless TRIAGE_URL is set.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = os.path.join("collector", "_boot", "oom_triage_collector.pth")


class build_py_with_pth(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        else:
            target = self.build_lib
        if target:
            self.copy_file(PTH, os.path.join(target, os.path.basename(PTH)))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = list(super().get_outputs(include_bytecode))
        if not getattr(self, "editable_mode", False):
            outputs.append(os.path.join(self.build_lib, os.path.basename(PTH)))
        return outputs


setup(cmdclass={"build_py": build_py_with_pth})
