// plunder's dashboard, live: each [data-live] element is replaced by the fragments its
// event stream sends (the server sends one only when it changed, at most once a second);
// a job's stream appends its chunks as they are written. No library, no build step.
"use strict";
function follow(url, handlers) {
  const source = new EventSource(url, { withCredentials: true });
  for (const [name, handle] of Object.entries(handlers)) {
    source.addEventListener(name, (event) => handle(event.data));
  }
  source.addEventListener("end", () => source.close());
  return source;
}
document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-live]")) {
    follow(element.dataset.live, { swap: (html) => { element.innerHTML = html; } });
  }
  const stream = document.querySelector("[data-job-live]");
  if (stream) {
    follow(stream.dataset.jobLive, {
      chunk: (text) => {
        const atEnd = stream.scrollTop + stream.clientHeight >= stream.scrollHeight - 4;
        stream.append(document.createTextNode(JSON.parse(text)));
        if (atEnd) stream.scrollTop = stream.scrollHeight;
      },
      mark: (text) => {
        const mark = document.createElement("span");
        mark.className = "mark";
        mark.textContent = JSON.parse(text);
        stream.append(mark);
      },
      progress: (text) => { document.getElementById("progress").textContent = JSON.parse(text); },
      status: (html) => { document.getElementById("job-status").innerHTML = html; },
    });
  }
});
