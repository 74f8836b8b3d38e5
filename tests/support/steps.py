"""Driving a chunk step outside Beam, as a runner calls it."""

from apache_beam.pvalue import TaggedOutput


def run_bundle(step, *chunks) -> list:
    """A step's outputs over one bundle of ``chunks``, as Beam calls it (an overlapped step's
    last chunk leaves at the end of the bundle, windowed)."""
    step.start_bundle()
    outputs = [output for chunk in chunks for output in step.process(chunk)]
    for windowed in step.finish_bundle() or ():
        outputs.append(TaggedOutput(windowed.tag, windowed.value.value)
                       if isinstance(windowed, TaggedOutput) else windowed.value)
    return outputs
