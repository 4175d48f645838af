"""Optional integrations that feed the collector the step and batch size a framework knows best.

Each lives in its own module and imports its framework; importing ``collector`` never imports them.
"""
