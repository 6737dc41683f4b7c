"""The pipeline's entry point for spark-submit, which needs a Python file:

    spark-submit --master spark://HOST:7077 --py-files mqttmesh.zip \\
        src/mqttmesh/pipeline/submit.py traffic --archive /data/archive --out /data/reports/traffic

The arguments are those of ``mqttmesh analyze`` (docs/pipeline.md); the master and
resources come from spark-submit unless --master is given.
"""

import sys

if __name__ == "__main__":
    try:
        from mqttmesh.pipeline.cli import main
    except ImportError:  # run from a source tree without the package installed
        import os

        sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
        from mqttmesh.pipeline.cli import main
    sys.exit(main(sys.argv[1:]))
