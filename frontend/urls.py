from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views

urlpatterns = [
    path("", views.home, name="home"),
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
