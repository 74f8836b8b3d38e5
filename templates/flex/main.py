"""Flex Template entry point (``FLEX_TEMPLATE_PYTHON_PY_FILE``): builds the graph and submits it.

The template launcher runs this file with the template's parameters and the job's environment
(``--runner=DataflowRunner``, project, region, temp and staging locations, ``sdk_container_image``)
as command-line options, then waits for it to exit: the job starts only once it has. The
pipeline's ``execute`` waits for the result on local runners only, so on Dataflow this returns
as soon as the job is submitted. Bad options or inputs exit with status 2 before any submission,
and the launcher shows the message.
"""

from beam_pipeline.cli import main

if __name__ == "__main__":
    main()
