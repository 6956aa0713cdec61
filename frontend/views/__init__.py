"""Console pages, one module per area. Views are thin: resolve the principal (frontend.access),
read through one selector, render a template."""
