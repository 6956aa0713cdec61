"""Console URLs. These paths are a contract: other tools (chat messages, tickets, the API's
`console_url` fields) link to them, so they change only with a redirect from the old path."""

from django.contrib.auth import views as auth_views
from django.urls import path, re_path

from frontend.views import fleet, health, home, incidents, jobs, price, settings_pages

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
    path("settings/", settings_pages.settings_index, name="settings"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="proof/registration/login.html", redirect_authenticated_user=True
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
