"""The settings pages (/settings/…): one module per page. Admins only (operator admins: the
fleet's settings; customer admins: their own customer's users and API tokens); everyone else
gets 404, as for a page that does not exist."""
