"""Physics evaluation of a generator: metrics, statistical floors, a condition-ignoring
baseline, plots and reports; sampling bundles to files (`muongen sample`, `muongen evaluate`).
"""
