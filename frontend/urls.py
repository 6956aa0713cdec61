"""Console URLs. These paths are a contract: other tools (chat messages, tickets, the API's
`console_url` fields) link to them, so they change only with a redirect from the old path."""

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from frontend.views import billing, fleet, health, home, incidents, jobs, price, share
from frontend.views.settings import agents as settings_agents
from frontend.views.settings import api_tokens as settings_api_tokens
from frontend.views.settings import audit as settings_audit
from frontend.views.settings import customers as settings_customers
from frontend.views.settings import index as settings_index
from frontend.views.settings import prices as settings_prices
from frontend.views.settings import users as settings_users
from tenants.login_throttle import ThrottledAuthenticationForm, throttled_login

urlpatterns = [
    path("", home.home, name="home"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("health/", health.health, name="health"),
    path("price/", price.price, name="price"),
    path("jobs/", jobs.job_list, name="jobs"),
    # Job ids come from schedulers and may hold any character but a slash-free tail is not
    # guaranteed (Kubernetes "namespace/name"), so the id is the rest of the path.
    re_path(r"^jobs/(?P<job_id>.+)/$", jobs.job_detail, name="job"),
    path("incidents/", incidents.incident_list, name="incidents"),
    path("incidents/<uuid:public_id>/", incidents.incident_detail, name="incident"),
    path("incidents/<uuid:public_id>/summary/", share.incident_summary, name="incident-summary"),
    path(
        "incidents/<uuid:public_id>/share-links/",
        share.share_link_create,
        name="incident-share-link-create",
    ),
    path(
        "incidents/<uuid:public_id>/share-links/<int:link_id>/revoke/",
        share.share_link_revoke,
        name="incident-share-link-revoke",
    ),
    # A share link (investigations/api/share_links.py): the token is the credential.
    path("share/<str:token>/", share.shared_verdict, name="share"),
    path("settings/", settings_index.settings_index, name="settings"),
    path("settings/customers/", settings_customers.customers, name="settings-customers"),
    path(
        "settings/customers/masking/",
        settings_customers.customer_masking,
        name="settings-customer-masking",
    ),
    path("settings/rules/", settings_customers.rules, name="settings-rules"),
    path("settings/rules/<int:rule_id>/", settings_customers.rule_edit, name="settings-rule"),
    path(
        "settings/rules/<int:rule_id>/delete/",
        settings_customers.rule_delete,
        name="settings-rule-delete",
    ),
    path("settings/agents/", settings_agents.agents, name="settings-agents"),
    path(
        "settings/agents/tokens/<int:token_id>/revoke/",
        settings_agents.agent_token_revoke,
        name="settings-agent-token-revoke",
    ),
    path("settings/api-tokens/", settings_api_tokens.api_tokens, name="settings-api-tokens"),
    path(
        "settings/api-tokens/<int:token_id>/revoke/",
        settings_api_tokens.api_token_revoke,
        name="settings-api-token-revoke",
    ),
    path("settings/audit/", settings_audit.audit_log, name="settings-audit"),
    path("settings/billing/", billing.billing_settings, name="settings-billing"),
    path(
        "settings/billing/chargeback.csv",
        billing.billing_chargeback_csv,
        name="settings-billing-chargeback",
    ),
    path("settings/billing/portal/", billing.billing_portal, name="settings-billing-portal"),
    path("settings/prices/", settings_prices.prices, name="settings-prices"),
    path("settings/prices/<int:price_id>/", settings_prices.price_edit, name="settings-price"),
    path(
        "settings/prices/<int:price_id>/delete/",
        settings_prices.price_delete,
        name="settings-price-delete",
    ),
    path("settings/users/", settings_users.users, name="settings-users"),
    path("settings/users/<int:member_id>/", settings_users.user_edit, name="settings-user"),
    path(
        "settings/users/<int:member_id>/active/",
        settings_users.user_active,
        name="settings-user-active",
    ),
    path(
        "settings/users/<int:member_id>/link/",
        settings_users.user_link,
        name="settings-user-link",
    ),
    # The one-time set-password link an admin gives an invited member (settings/users/).
    path(
        "password/set/<uidb64>/<token>/",
        settings_users.PasswordSetView.as_view(),
        name="password_set",
    ),
    path(
        "password/set/done/", settings_users.PasswordSetDoneView.as_view(), name="password_set_done"
    ),
    path(
        "login/",
        # Throttled per account and address (tenants/login_throttle.py): 429 when locked.
        throttled_login(
            auth_views.LoginView.as_view(
                template_name="proof/registration/login.html",
                redirect_authenticated_user=True,
                authentication_form=ThrottledAuthenticationForm,
            )
        ),
        name="login",
    ),
    path(
        "logout/",
        auth_views.LogoutView.as_view(template_name="proof/registration/logged_out.html"),
        name="logout",
    ),
    path(
        "password/",
        auth_views.PasswordChangeView.as_view(
            template_name="proof/registration/password_change_form.html"
        ),
        name="password_change",
    ),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(
            template_name="proof/registration/password_change_done.html"
        ),
        name="password_change_done",
    ),
]
