"""Grid submission for muongen: a campaign file becomes an HTCondor DAGMan chain.

``python -m submit plan|write|submit|status`` (see ``submit/__main__.py``). One node per
range of input files; each node trains its range, continuing from the previous range's
checkpoint, and publishes its own to Pelican/OSDF (design section 4 and 6).

Imports only the standard library, PyYAML and ``htcondor2`` (an access point has neither
muongen nor torch). ``submit.campaign`` needs no HTCondor at all: ``muongen chain --local``
uses it to walk the same chain on one machine.
"""
