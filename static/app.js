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
