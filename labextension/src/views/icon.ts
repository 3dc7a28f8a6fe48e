/** The sidebar icon: a graphics card (fans on a board), in the theme's icon colour. */
import { LabIcon } from '@jupyterlab/ui-components';

const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path fill-rule="evenodd" d="M2 6h19a1 1 0 0 1 1 1v10a1 1 0 0 1-1 1H9v2H6v-2H4v2H2zm5.5 2.5a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7zm9 0a3.5 3.5 0 1 0 0 7 3.5 3.5 0 0 0 0-7z"/>
    <circle cx="7.5" cy="12" r="1.3"/>
    <circle cx="16.5" cy="12" r="1.3"/>
  </g>
</svg>`;

export const gpulayerIcon = new LabIcon({ name: 'gpulayer:icon', svgstr });
