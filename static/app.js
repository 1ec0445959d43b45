// pitlane console: the little JavaScript it has. htmx (htmx.min.js, 2.0.11, BSD-0) does the
// rest; every page also works without JavaScript.

// Every htmx request carries the page's CSRF token, read from <meta name="csrf-token">, in the
// X-CSRF-Token header (forms also carry it in a hidden field for requests without JavaScript).
document.addEventListener("htmx:configRequest", function (e) {
  var meta = document.querySelector('meta[name="csrf-token"]');
  if (meta) {
    e.detail.headers["X-CSRF-Token"] = meta.content;
  }
});

// A "select all" box ticks every row box of its form (the finance workbench). Without
// JavaScript each row is ticked by hand; the form works the same.
document.addEventListener("change", function (e) {
  var box = e.target;
  if (!box.classList || !box.classList.contains("select-all") || !box.form) {
    return;
  }
  box.form.querySelectorAll('input[type="checkbox"][name="id"]').forEach(function (row) {
    row.checked = box.checked;
  });
});

// A refused action (4xx, 5xx) is shown as the same post without JavaScript shows it. htmx swaps
// no error answer by itself, so a button whose post was refused did nothing on the page (an
// outside review: a role changed while the page was open, a form that expired, the database
// away). An answer holding what the form swaps (the payment page again, with the refusal in its
// flash and the form as typed) is swapped in as a success would be; any other (the error page:
// 403, 404, 503 with its "Try again") replaces the page's main content.
// Only a form's own post: a live region's refresh (a GET of live.js) that meets an error keeps
// the page as it is and is tried again (it replaced the page with the error page, which nothing
// refreshed any more once the database was back: a review of this handler).
document.addEventListener("htmx:beforeSwap", function (e) {
  var d = e.detail;
  var cfg = d.requestConfig;
  if (!d.xhr || d.xhr.status < 400 || d.shouldSwap || !cfg || !cfg.elt || cfg.verb === "get" ||
      cfg.elt.tagName !== "FORM") {
    return;
  }
  var answer = new DOMParser().parseFromString(d.xhr.responseText, "text/html");
  var swaps = cfg.elt.closest("[hx-select]");
  var sel = swaps ? swaps.getAttribute("hx-select") : "";
  d.shouldSwap = true;
  d.isError = false;
  if (sel && answer.querySelector(sel)) {
    return;
  }
  var main = document.querySelector("main");
  if (!main || !answer.querySelector("main")) {
    d.shouldSwap = false;
    return;
  }
  d.target = main;
  d.selectOverride = "main";
  d.swapOverride = "outerHTML";
});

// After a form's own htmx swap the element that had the keyboard focus (the form's button, the
// code field) is gone with the block it was in, and the focus fell to the page's body: a keyboard
// user started again at the top of the page, behind the navigation (an outside review: "Request
// cancel", then a wrong code). The focus goes where the answer's work is: the field marked
// data-focus-after-swap (the code the customer reads out), else the flash saying what happened,
// else a refusal's error page (a role changed, a CSRF token gone, a 503: htmx:beforeSwap above
// swapped its main in; it has no flash, and a keyboard user heard nothing: an outside review).
// Only after the user's own form, and only when the focus fell to the body: a live refresh
// (live.js, X-Pitlane-Live) never moves it here, which is why the code field is not autofocus
// (htmx honours autofocus on every swap, a live refresh's too).
document.addEventListener("htmx:afterSettle", function (e) {
  var cfg = e.detail.requestConfig;
  var a = document.activeElement;
  if (!cfg || !cfg.elt || cfg.elt.tagName !== "FORM" || (cfg.headers && cfg.headers["X-Pitlane-Live"] === "1") ||
      (a && a !== document.body)) {
    return;
  }
  var to = document.querySelector("[data-focus-after-swap]") || document.querySelector("#flashes .flash") ||
    document.querySelector("main .error-page");
  if (to) {
    to.focus();
  }
});
